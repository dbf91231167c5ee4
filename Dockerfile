FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN pip install --no-cache-dir .
COPY examples/docker.yaml /etc/context-proxy/config.yaml
ENV CONTEXT_PROXY_CONFIG=/etc/context-proxy/config.yaml
VOLUME /var/lib/context-proxy
EXPOSE 8080
STOPSIGNAL SIGTERM
CMD ["context-proxy", "serve"]
