"""moto's S3 server on loopback; DuckDB reads Parquet and CSV from it through httpfs (offline extension file)."""
import sys, time, os, socket, duckdb
from moto.server import ThreadedMotoServer
import boto3
ext = sys.argv[1]              # path of httpfs.duckdb_extension
port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
t0 = time.time()
srv = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False); srv.start()
host, port = srv.get_host_and_port()
print(f"moto {host}:{port} up after {time.time()-t0:.2f}s")
s3 = boto3.client("s3", endpoint_url=f"http://{host}:{port}", aws_access_key_id="tally", aws_secret_access_key="tallysecret", region_name="us-east-1")
s3.create_bucket(Bucket="lake")
c = duckdb.connect(config={"allow_unsigned_extensions": "true", "autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
print("duckdb", duckdb.__version__)
c.sql("COPY (SELECT range AS id, 'r' || range AS s, CAST(range AS DECIMAL(18,2)) / 3 AS d FROM range(1000)) TO '/tmp/t.parquet' (FORMAT parquet)")
c.sql("COPY (SELECT range AS id, 'r' || range AS s FROM range(10)) TO '/tmp/t.csv' (FORMAT csv, HEADER)")
s3.upload_file("/tmp/t.parquet", "lake", "tables/t/part-0.parquet")
s3.upload_file("/tmp/t.parquet", "lake", "tables/t/part-1.parquet")
s3.upload_file("/tmp/t.csv", "lake", "csv/t.csv")
try:
    c.sql(f"LOAD '{ext}'"); print("LOAD ok:", c.sql("SELECT extension_name, loaded, extension_version FROM duckdb_extensions() WHERE extension_name='httpfs'").fetchall())
except Exception as e:
    print("LOAD failed:", str(e)[:400]); srv.stop(); sys.exit(1)
c.sql(f"""CREATE SECRET s3lake (TYPE s3, KEY_ID 'tally', SECRET 'tallysecret', REGION 'us-east-1',
          ENDPOINT '{host}:{port}', URL_STYLE 'path', USE_SSL false)""")
print(c.sql("SELECT count(*), sum(id), min(d), max(s) FROM read_parquet('s3://lake/tables/t/*.parquet')").fetchall())
print(c.sql("DESCRIBE SELECT * FROM read_parquet('s3://lake/tables/t/*.parquet')").fetchall())
print(c.sql("SELECT * FROM read_csv('s3://lake/csv/t.csv', header=true, columns={'id': 'BIGINT', 's': 'VARCHAR'}) ORDER BY id LIMIT 3").fetchall())
print(c.sql("SELECT file FROM glob('s3://lake/tables/t/*.parquet')").fetchall())
try:
    c.sql("SELECT count(*) FROM read_parquet('s3://lake/nope/*.parquet')").fetchall()
except Exception as e: print("missing glob:", str(e).splitlines()[0][:200])
try:
    c.sql(f"CREATE OR REPLACE SECRET s3lake (TYPE s3, KEY_ID 'tally', SECRET 'wrong', REGION 'us-east-1', ENDPOINT '{host}:{port}', URL_STYLE 'path', USE_SSL false)")
    print("wrong secret:", c.sql("SELECT count(*) FROM read_parquet('s3://lake/tables/t/part-0.parquet')").fetchall(), "(moto does not check signatures by default)")
except Exception as e: print("wrong secret:", str(e).splitlines()[0][:200])
srv.stop(); print(f"total {time.time()-t0:.2f}s")
