"""The stages of the request path, one feature each (the list: ``proxy.server.exchange.chain``)."""
