"""Wire formats other than the Anthropic Messages API's own: pure codecs, no I/O."""
