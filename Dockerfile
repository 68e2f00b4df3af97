# gridmem worker service image: `docker compose up` builds it from this checkout.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gridmem ./gridmem
COPY worker ./worker
COPY lua ./lua
COPY bin ./bin
RUN pip install --no-cache-dir . && useradd --create-home gridmem
USER gridmem
ENTRYPOINT ["gridmem"]
CMD ["serve"]
