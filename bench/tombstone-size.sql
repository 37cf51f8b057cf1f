-- Bytes per tombstone at 10 M tombstones (docs/operations.md, "Postgres: sizing the keys table").
-- psql -h 127.0.0.1 -U postgres -d postgres -f bench/tombstone-size.sql   (about 2 GB of disk while it runs; drops its schema)
-- The table and indexes are those of migration 017_key_tombstones (src/store/sql/tombstones.ts).
\timing on
create schema tomb_size_probe;
create table tomb_size_probe.key_tombstones (
  scope text not null, key_hash bytea not null, fingerprint_hash bytea not null, failed boolean not null,
  finished_at timestamptz not null, expires_at timestamptz not null, primary key (scope, key_hash));
create index key_tombstones_expiry on tomb_size_probe.key_tombstones (expires_at);
insert into tomb_size_probe.key_tombstones
select 'payments', sha256(convert_to('order-' || n, 'UTF8')), sha256(convert_to('fp-' || n, 'UTF8')), false,
       now() - (n % 86400) * interval '1 second', now() + interval '30 days' - (n % 86400) * interval '1 second'
  from generate_series(1, 10000000) as n;
vacuum analyze tomb_size_probe.key_tombstones;
select pg_size_pretty(pg_relation_size('tomb_size_probe.key_tombstones')) as heap,
       pg_size_pretty(pg_relation_size('tomb_size_probe.key_tombstones_pkey')) as pkey,
       pg_size_pretty(pg_relation_size('tomb_size_probe.key_tombstones_expiry')) as expiry,
       pg_size_pretty(pg_total_relation_size('tomb_size_probe.key_tombstones')) as total,
       round(pg_total_relation_size('tomb_size_probe.key_tombstones') / 1e7, 1) as bytes_per_key,
       round(pg_relation_size('tomb_size_probe.key_tombstones') / 1e7, 1) as heap_bytes_per_key;
drop schema tomb_size_probe cascade;
