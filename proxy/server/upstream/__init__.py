"""Upstream platforms other than the Anthropic API: Bedrock Runtime and Vertex AI (signing,
credentials, and their answers presented as the Anthropic API's)."""
