FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
# the tracing extra: OTEL_EXPORTER_OTLP_ENDPOINT alone turns traces on (docs/guides/traces.md)
RUN pip install --no-cache-dir ".[tracing]"
COPY examples/docker.yaml /etc/context-proxy/config.yaml
ENV CONTEXT_PROXY_CONFIG=/etc/context-proxy/config.yaml
# Small objects from glibc, not Python's arenas: after a burst of streams the idle step's
# malloc_trim gives the memory back (1.06x rest instead of 1.3x; bench/bench_memory.py). It costs
# ~0.1 ms on a small request and ~0.5-3 ms on a large never-seen body (bench/README.md): unset it
# where latency matters more than the memory a burst leaves behind.
ENV PYTHONMALLOC=malloc
VOLUME /var/lib/context-proxy
EXPOSE 8080
# `docker run` and compose: healthy once listening (compose's replicas probe /readyz themselves)
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
# SIGTERM drains (shutdown.grace_seconds, 25 s in the image's config): stop with a longer timeout
# (`docker run --stop-timeout 30`, compose's stop_grace_period 30s; docker's default is 10 s)
STOPSIGNAL SIGTERM
CMD ["context-proxy", "serve"]
