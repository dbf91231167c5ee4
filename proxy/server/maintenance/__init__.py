"""Work off the request path: the garbage collector (``retention``) and handing memory back to
the system once the proxy is idle (``idle_trim``)."""
