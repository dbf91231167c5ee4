"""Durable context and retrieval: sessions, their conversations and the injected block,
transcripts recorded per conversation, and the retrieval loop that answers the model's calls
from verified sources."""
