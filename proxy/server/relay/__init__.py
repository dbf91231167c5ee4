"""Talking to the upstream: forwarding a request, relaying its answer (SSE split into events,
the rounds of one answer spliced into one stream), and reading the answer as it passes (folded
into a message, the provider's usage tapped)."""
