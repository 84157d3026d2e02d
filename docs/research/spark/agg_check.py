"""SUM and XOR of sha256_64 row checksums in Spark vs Python's hashlib, mod 2^64."""
import sys, hashlib, warnings; warnings.filterwarnings("ignore")
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(f"sc://127.0.0.1:{sys.argv[1]}").getOrCreate()
H = "CAST(conv(substr(sha2(r, 256), 1, 16), 16, -10) AS BIGINT)"
row = spark.sql(f"""SELECT COUNT(*) AS n, CAST(SUM(CAST(h AS DECIMAL(38,0))) AS STRING) AS s, CAST(bit_xor(h) AS STRING) AS x
FROM (SELECT {H} AS h FROM (SELECT COALESCE(CAST(octet_length(CAST(id AS STRING)) AS STRING) || ':' || CAST(id AS STRING), '~') AS r FROM range(100000)) a) z""").collect()[0]
py_sum = py_xor = 0
for i in range(100000):
    r = f"{len(str(i))}:{i}".encode()
    v = int.from_bytes(hashlib.sha256(r).digest()[:8], "big")
    py_sum = (py_sum + v) % 2**64; py_xor ^= v
print("spark n,s,x:", row.n, row.s, row.x)
print("spark sum mod 2^64 =", int(row.s) % 2**64, " python =", py_sum, " equal:", int(row.s) % 2**64 == py_sum)
print("spark xor as u64   =", int(row.x) % 2**64, " python =", py_xor, " equal:", int(row.x) % 2**64 == py_xor)
print("sum exceeded 2^64 in magnitude? (signed partial sums)", abs(int(row.s)) > 2**63)
for t in ["1.9999999999999998E23", "9.999999999999999E22", "5.833999999999999E21"]:
    print(t, "reads back as", repr(float(t)))
