"""The compaction edge: the service that runs the pure core (``proxy.core.compaction``) on a
request and reports its outcome in headers, the L4 summary call under a store lease, counting
while forwarding, plans read through from the store, naming removed turns by their transcript
events, and the thinking-block guard."""
