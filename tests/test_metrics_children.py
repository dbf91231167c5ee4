"""``Metrics.child``: the labelled child of a metric, looked up once, counts as ``labels`` does."""

from __future__ import annotations

from proxy.server.http.metrics import new_metrics


def test_a_child_is_the_labelled_child_and_counts_in_the_exposition() -> None:
    metrics = new_metrics()
    ok = metrics.child(metrics.requests, "messages", "200")
    assert ok is metrics.requests.labels("messages", "200")
    assert metrics.child(metrics.requests, "messages", "200") is ok
    other = metrics.child(metrics.requests, "messages", "529")
    assert other is not ok
    ok.inc()
    ok.inc()
    other.inc()
    metrics.child(metrics.added_latency, "messages").observe(0.0003)
    text = metrics.render().decode()
    assert 'context_proxy_requests_total{route="messages",status="200"} 2.0' in text
    assert 'context_proxy_requests_total{route="messages",status="529"} 1.0' in text
    assert 'context_proxy_added_latency_seconds_bucket{le="0.0005",route="messages"} 1.0' in text
    assert 'context_proxy_added_latency_seconds_bucket{le="0.00025",route="messages"} 0.0' in text


def test_children_of_different_metrics_with_the_same_values_are_apart() -> None:
    metrics = new_metrics()
    latency = metrics.child(metrics.upstream_latency, "messages")
    added = metrics.child(metrics.added_latency, "messages")
    assert latency is not added
    assert latency is metrics.upstream_latency.labels("messages")
    assert added is metrics.added_latency.labels("messages")
    # apps (and tests) each have their own registry: another app's child is another object
    another = new_metrics()
    mine = metrics.child(metrics.requests, "messages", "200")
    assert another.child(another.requests, "messages", "200") is not mine
