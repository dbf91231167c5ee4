"""The aiohttp edge: routes, forwarding, streaming relay, metrics, lifecycle."""
