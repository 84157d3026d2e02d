# Both binaries in one small image: `tally-agent` (the default command) and `tally`.
#   docker build -t tally:0.1.0 .
# Not built in this repository's CI (no container engine there); see docs/operations.md.
# Engines are cargo features of the agent: this image carries PostgreSQL, MySQL/MariaDB,
# SQLite, SQL Server (mssql), Oracle (oracle; Oracle Instant Client must be added to
# the image to reach one), Spark/Databricks (spark, Spark Connect over gRPC) and
# ClickHouse (clickhouse, its HTTP interface). DuckDB links libduckdb; this image leaves
# it out.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    cargo build --release --locked -p tally-agent -p tally-cli --bins \
      --features tally-agent/mssql,tally-agent/oracle,tally-agent/spark,tally-agent/clickhouse \
 && strip target/release/tally target/release/tally-agent

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --no-create-home tally
COPY --from=build /src/target/release/tally /src/target/release/tally-agent /usr/local/bin/
USER 10001:10001
EXPOSE 7401
ENTRYPOINT []
CMD ["tally-agent", "-c", "/etc/tally/agent.yaml"]
