-- row string
(in-process)

-- row checksum sealed_sha256_64
(in-process)

-- row checksum sealed_md5_48
(in-process)

-- row checksum sha256_64
(in-process)

-- row checksum md5_48
(in-process)

-- fetch rows (Raw, ordered)
SELECT "region" AS "tally_f0", "id" AS "tally_f1", "amount" AS "tally_f2", "ratio" AS "tally_f3", "ok" AS "tally_f4", "code" AS "tally_f5", "day" AS "tally_f6", "at" AS "tally_f7", "at_utc" AS "tally_f8", "t" AS "tally_f9", "u" AS "tally_f10", "b" AS "tally_f11" FROM "shop"."orders" WHERE ("region", "id") >= (CAST(? AS VARCHAR), CAST(? AS BIGINT)) AND ("region", "id") < (CAST(? AS VARCHAR), CAST(? AS BIGINT)) ORDER BY "region", "id"
-- binds: [Text("EU"), Int(10), Text("US"), Int(0)]

-- fetch rows (Canonical, ordered)
SELECT CAST("region" AS VARCHAR) AS "tally_f0", CAST("id" AS VARCHAR) AS "tally_f1", CASE WHEN CAST("amount" AS DECIMAL(38, 2)) = 0 THEN '0.00' ELSE CAST(CAST("amount" AS DECIMAL(38, 2)) AS VARCHAR) END AS "tally_f2", CAST(CAST("ratio" AS DOUBLE) AS VARCHAR) AS "tally_f3", CASE WHEN "ok" THEN '1' WHEN NOT "ok" THEN '0' END AS "tally_f4", rtrim(CAST("code" AS VARCHAR), ' ') AS "tally_f5", CAST(CAST("day" AS DATE) AS VARCHAR) AS "tally_f6", CAST(CAST(CAST("at" AS TIMESTAMP) AS DATE) AS VARCHAR) || 'T' || strftime(CAST("at" AS TIMESTAMP), '%H:%M:%S') || '.' || substr(lpad(CAST(date_part('microseconds', CAST("at" AS TIMESTAMP)) % 1000000 AS VARCHAR), 6, '0'), 1, 3) AS "tally_f7", CAST(CAST(CAST("at_utc" AS TIMESTAMP) AS DATE) AS VARCHAR) || 'T' || strftime(CAST("at_utc" AS TIMESTAMP), '%H:%M:%S') || '.' || substr(lpad(CAST(date_part('microseconds', CAST("at_utc" AS TIMESTAMP)) % 1000000 AS VARCHAR), 6, '0'), 1, 6) || 'Z' AS "tally_f8", substr(CAST("t" AS VARCHAR), 1, 8) AS "tally_f9", lower(CAST("u" AS VARCHAR)) AS "tally_f10", lower(hex("b")) AS "tally_f11" FROM "shop"."orders" WHERE ("region", "id") >= (CAST(? AS VARCHAR), CAST(? AS BIGINT)) AND ("region", "id") < (CAST(? AS VARCHAR), CAST(? AS BIGINT)) ORDER BY "region", "id"
-- binds: [Text("EU"), Int(10), Text("US"), Int(0)]

-- fetch rows (Text, ordered)
SELECT CAST("region" AS VARCHAR) AS "tally_f0", CAST("id" AS VARCHAR) AS "tally_f1", CASE WHEN CAST("amount" AS DECIMAL(38, 2)) = 0 THEN '0.00' ELSE CAST(CAST("amount" AS DECIMAL(38, 2)) AS VARCHAR) END AS "tally_f2", CAST(CAST("ratio" AS DOUBLE) AS VARCHAR) AS "tally_f3", CASE WHEN "ok" THEN '1' WHEN NOT "ok" THEN '0' END AS "tally_f4", rtrim(CAST("code" AS VARCHAR), ' ') AS "tally_f5", CAST(CAST("day" AS DATE) AS VARCHAR) AS "tally_f6", CAST(CAST(CAST("at" AS TIMESTAMP) AS DATE) AS VARCHAR) || 'T' || strftime(CAST("at" AS TIMESTAMP), '%H:%M:%S') || '.' || substr(lpad(CAST(date_part('microseconds', CAST("at" AS TIMESTAMP)) % 1000000 AS VARCHAR), 6, '0'), 1, 3) AS "tally_f7", CAST(CAST(CAST("at_utc" AS TIMESTAMP) AS DATE) AS VARCHAR) || 'T' || strftime(CAST("at_utc" AS TIMESTAMP), '%H:%M:%S') || '.' || substr(lpad(CAST(date_part('microseconds', CAST("at_utc" AS TIMESTAMP)) % 1000000 AS VARCHAR), 6, '0'), 1, 6) || 'Z' AS "tally_f8", substr(CAST("t" AS VARCHAR), 1, 8) AS "tally_f9", lower(CAST("u" AS VARCHAR)) AS "tally_f10", lower(hex("b")) AS "tally_f11" FROM "shop"."orders" WHERE ("region", "id") >= (CAST(? AS VARCHAR), CAST(? AS BIGINT)) AND ("region", "id") < (CAST(? AS VARCHAR), CAST(? AS BIGINT)) ORDER BY "region", "id"
-- binds: [Text("EU"), Int(10), Text("US"), Int(0)]

-- count
SELECT COUNT(*) FROM "shop"."orders" WHERE ("region", "id") >= (CAST(? AS VARCHAR), CAST(? AS BIGINT)) AND ("region", "id") < (CAST(? AS VARCHAR), CAST(? AS BIGINT))
-- binds: [Text("EU"), Int(10), Text("US"), Int(0)]

-- aggregate (sealed_sha256_64)
(in-process)

-- aggregate (sha256_64)
(in-process)

-- aggregate per period
(in-process)

-- fetch rows of one week
SELECT CAST("region" AS VARCHAR) AS "tally_f0", CAST("id" AS VARCHAR) AS "tally_f1", CASE WHEN CAST("amount" AS DECIMAL(38, 2)) = 0 THEN '0.00' ELSE CAST(CAST("amount" AS DECIMAL(38, 2)) AS VARCHAR) END AS "tally_f2", CAST(CAST("ratio" AS DOUBLE) AS VARCHAR) AS "tally_f3", CASE WHEN "ok" THEN '1' WHEN NOT "ok" THEN '0' END AS "tally_f4", rtrim(CAST("code" AS VARCHAR), ' ') AS "tally_f5", CAST(CAST("day" AS DATE) AS VARCHAR) AS "tally_f6", CAST(CAST(CAST("at" AS TIMESTAMP) AS DATE) AS VARCHAR) || 'T' || strftime(CAST("at" AS TIMESTAMP), '%H:%M:%S') || '.' || substr(lpad(CAST(date_part('microseconds', CAST("at" AS TIMESTAMP)) % 1000000 AS VARCHAR), 6, '0'), 1, 3) AS "tally_f7" FROM "shop"."orders" WHERE strftime(date_trunc('week', CAST(substr(CAST(CAST(CAST("at" AS TIMESTAMP) AS DATE) AS VARCHAR) || 'T' || strftime(CAST("at" AS TIMESTAMP), '%H:%M:%S') || '.' || substr(lpad(CAST(date_part('microseconds', CAST("at" AS TIMESTAMP)) % 1000000 AS VARCHAR), 6, '0'), 1, 3), 1, 10) AS DATE)), '%Y-%m-%d') = ?
-- binds: [Text("2024-03-11")]

-- investigation
SELECT "region", "id", "amount", "ratio" FROM "shop"."orders" WHERE ("region", "id") >= (decode(from_hex('4555')), 10) AND ("region", "id") < (decode(from_hex('5553')), 0) AND CAST('0x' || substr(sha256((COALESCE(CAST(strlen(CAST("region" AS VARCHAR)) AS VARCHAR) || ':' || CAST("region" AS VARCHAR), '~') || COALESCE(CAST(strlen(CAST("id" AS VARCHAR)) AS VARCHAR) || ':' || CAST("id" AS VARCHAR), '~'))), 1, 15) AS BIGINT) >= 288230376151711744 AND CAST('0x' || substr(sha256((COALESCE(CAST(strlen(CAST("region" AS VARCHAR)) AS VARCHAR) || ':' || CAST("region" AS VARCHAR), '~') || COALESCE(CAST(strlen(CAST("id" AS VARCHAR)) AS VARCHAR) || ':' || CAST("id" AS VARCHAR), '~'))), 1, 15) AS BIGINT) < 576460752303423488 ORDER BY "region", "id";

-- investigation of a sealed run: no hash range (it needs the run key)
-- hash range [288230376151711744, 576460752303423488) of a sealed run: it needs the run key, which never leaves the agents; these are every row of the key range
SELECT "region", "id", "amount", "ratio" FROM "shop"."orders" WHERE ("region", "id") >= (decode(from_hex('4555')), 10) AND ("region", "id") < (decode(from_hex('5553')), 0) ORDER BY "region", "id";

