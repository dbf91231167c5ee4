FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
# the tracing extra: OTEL_EXPORTER_OTLP_ENDPOINT alone turns traces on (README, Traces)
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
STOPSIGNAL SIGTERM
CMD ["context-proxy", "serve"]
