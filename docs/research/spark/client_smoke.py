import sys, time
from pyspark.sql import SparkSession
port = sys.argv[1]
t0 = time.time()
spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
def q(s):
    try:
        r = spark.sql(s).collect()
        print("OK ", s, "->", [tuple(x) for x in r])
    except Exception as e:
        print("ERR", s, "->", type(e).__name__, str(e).splitlines()[0][:300])
q("SELECT version()")
q("SET spark.sql.ansi.enabled"); q("SET spark.sql.session.timeZone"); q("SET spark.sql.catalogImplementation")
q("DROP TABLE IF EXISTS t")
q("CREATE TABLE t (id BIGINT, v BIGINT, s STRING) USING parquet")
q("INSERT INTO t VALUES (1, 9223372036854775807, 'a'), (2, 1, 'b'), (3, -5, NULL)")
q("SELECT id, sha2(s, 256) FROM t ORDER BY id")
q("SELECT bit_xor(v), count(*) FROM t")
q("SELECT sum(v) FROM t")
q("SELECT try_sum(v) FROM t")
q("SELECT sum(CAST(v AS DECIMAL(38,0))) FROM t")
q("SELECT 9223372036854775807 + 1")
q("SELECT try_add(9223372036854775807, 1)")
q("CREATE TABLE d (id INT) USING delta")
q("SHOW TABLES")
print("elapsed", round(time.time()-t0,2))
