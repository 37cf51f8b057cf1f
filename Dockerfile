# One image for every process of the demo: workers, relay, producer, migrations.
FROM node:22-bookworm-slim
WORKDIR /app
COPY package.json package-lock.json ./
# --ignore-scripts: the package's `prepare` builds, and the sources are not copied yet.
RUN npm ci --no-audit --no-fund --ignore-scripts
COPY . .
RUN npm run build
ENV NODE_ENV=production
CMD ["node", "bin/idempotent-jobs.js", "--help"]
