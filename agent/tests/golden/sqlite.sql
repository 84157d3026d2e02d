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
SELECT "region" AS "tally_f0", "id" AS "tally_f1", "amount" AS "tally_f2", "ratio" AS "tally_f3", "ok" AS "tally_f4", "code" AS "tally_f5", "day" AS "tally_f6", "at" AS "tally_f7", "at_utc" AS "tally_f8", "t" AS "tally_f9", "u" AS "tally_f10", "b" AS "tally_f11" FROM "shop"."orders" WHERE ("region" COLLATE BINARY, "id") >= (?, ?) AND ("region" COLLATE BINARY, "id") < (?, ?) ORDER BY "region" COLLATE BINARY, "id"
-- binds: [Text("EU"), Int(10), Text("US"), Int(0)]

-- fetch rows (Canonical, ordered)
SELECT "region" AS "tally_f0", "id" AS "tally_f1", "amount" AS "tally_f2", "ratio" AS "tally_f3", "ok" AS "tally_f4", "code" AS "tally_f5", "day" AS "tally_f6", "at" AS "tally_f7", "at_utc" AS "tally_f8", "t" AS "tally_f9", "u" AS "tally_f10", "b" AS "tally_f11" FROM "shop"."orders" WHERE ("region" COLLATE BINARY, "id") >= (?, ?) AND ("region" COLLATE BINARY, "id") < (?, ?) ORDER BY "region" COLLATE BINARY, "id"
-- binds: [Text("EU"), Int(10), Text("US"), Int(0)]

-- fetch rows (Text, ordered)
SELECT "region" AS "tally_f0", "id" AS "tally_f1", "amount" AS "tally_f2", "ratio" AS "tally_f3", "ok" AS "tally_f4", "code" AS "tally_f5", "day" AS "tally_f6", "at" AS "tally_f7", "at_utc" AS "tally_f8", "t" AS "tally_f9", "u" AS "tally_f10", "b" AS "tally_f11" FROM "shop"."orders" WHERE ("region" COLLATE BINARY, "id") >= (?, ?) AND ("region" COLLATE BINARY, "id") < (?, ?) ORDER BY "region" COLLATE BINARY, "id"
-- binds: [Text("EU"), Int(10), Text("US"), Int(0)]

-- count
SELECT COUNT(*) FROM "shop"."orders" WHERE ("region" COLLATE BINARY, "id") >= (?, ?) AND ("region" COLLATE BINARY, "id") < (?, ?)
-- binds: [Text("EU"), Int(10), Text("US"), Int(0)]

-- aggregate (sealed_sha256_64)
(in-process)

-- aggregate (sha256_64)
(in-process)

-- aggregate per period
(in-process)

-- fetch rows of one week
SELECT "region" AS "tally_f0", "id" AS "tally_f1", "amount" AS "tally_f2", "ratio" AS "tally_f3", "ok" AS "tally_f4", "code" AS "tally_f5", "day" AS "tally_f6", "at" AS "tally_f7" FROM "shop"."orders"

-- investigation
SELECT "region", "id", "amount", "ratio" FROM "shop"."orders" WHERE ("region" COLLATE BINARY, "id") >= (CAST(X'4555' AS TEXT), 10) AND ("region" COLLATE BINARY, "id") < (CAST(X'5553' AS TEXT), 0) ORDER BY "region" COLLATE BINARY, "id";

-- investigation of a sealed run: no hash range (it needs the run key)
-- hash range [288230376151711744, 576460752303423488) of a sealed run: it needs the run key, which never leaves the agents; these are every row of the key range
SELECT "region", "id", "amount", "ratio" FROM "shop"."orders" WHERE ("region" COLLATE BINARY, "id") >= (CAST(X'4555' AS TEXT), 10) AND ("region" COLLATE BINARY, "id") < (CAST(X'5553' AS TEXT), 0) ORDER BY "region" COLLATE BINARY, "id";

-- investigation of keys: a single integer key
SELECT "id", "amount", "ratio" FROM "shop"."orders" WHERE "id" IN (7, -42) ORDER BY "id";

-- investigation of keys: a composite text key (one holds a quote), within a window
SELECT "region", "id", "amount", "ratio" FROM "shop"."orders" WHERE (("region" COLLATE BINARY = CAST(X'4f27427269656e' AS TEXT) AND "id" = 7) OR ("region" COLLATE BINARY = CAST(X'4555' AS TEXT) AND "id" = 10)) AND "id" <= 1000 ORDER BY "region" COLLATE BINARY, "id";

-- key minimum
SELECT CAST(MIN("id") AS TEXT) FROM "shop"."orders"

-- key maximum
SELECT CAST(MAX("id") AS TEXT) FROM "shop"."orders"

-- count of a query dataset
SELECT COUNT(*) FROM (SELECT id, region FROM shop.orders WHERE region <> 'XX') "tally_src"

-- watermark (an agent-side query)
SELECT CAST((SELECT MAX(applied) FROM cdc.offsets) AS TEXT)

