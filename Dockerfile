FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
# the tracing extra: OTEL_EXPORTER_OTLP_ENDPOINT alone turns traces on (docs/guides/traces.md)
RUN pip install --no-cache-dir ".[tracing]"
COPY examples/docker.yaml /etc/context-proxy/config.yaml
ENV CONTEXT_PROXY_CONFIG=/etc/context-proxy/config.yaml
# Small objects from malloc, not Python's arenas: after a burst of streams the idle step gives
# the memory back (1.02-1.06x rest instead of 1.3x; bench/bench_memory.py, bench/bench_soak.py).
# And that malloc is jemalloc, not glibc's: under a steady load glibc's heap fragments and grows
# on (+6-14 % over a 30-minute soak's second half), jemalloc's levels off with the caches
# (bench/README.md, "bench/bench_soak.py"). The link in /usr/local/lib names it on any architecture.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libjemalloc2 \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "$(ls /usr/lib/*-linux-gnu/libjemalloc.so.2)" /usr/local/lib/libjemalloc.so.2
ENV PYTHONMALLOC=malloc
ENV LD_PRELOAD=/usr/local/lib/libjemalloc.so.2
VOLUME /var/lib/context-proxy
EXPOSE 8080
# `docker run` and compose: healthy once listening (compose's replicas probe /readyz themselves)
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
# SIGTERM drains (shutdown.grace_seconds, 25 s in the image's config): stop with a longer timeout
# (`docker run --stop-timeout 30`, compose's stop_grace_period 30s; docker's default is 10 s)
STOPSIGNAL SIGTERM
CMD ["context-proxy", "serve"]
