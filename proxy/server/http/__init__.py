"""The HTTP edge: the serve loop and its signals, client connections and their limits, the
Prometheus metrics, ``/readyz``'s store check."""
