# gridmem worker service image: `docker compose up` builds it from this checkout.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY worker ./worker
COPY lua ./lua
RUN pip install --no-cache-dir . && useradd --create-home gridmem
USER gridmem
ENTRYPOINT ["gridmem"]
CMD ["serve"]
