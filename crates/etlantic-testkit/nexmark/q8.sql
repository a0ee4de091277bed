WITH wm AS (
  SELECT least(
    (SELECT date_trunc('millisecond', max(date_time)) FROM persons),
    (SELECT date_trunc('millisecond', max(date_time)) FROM auctions)
  ) - INTERVAL '2 seconds' AS w
),
p AS (SELECT DISTINCT id, name, date_bin(INTERVAL '10 seconds', date_time) AS window_start FROM persons),
a AS (SELECT DISTINCT seller, date_bin(INTERVAL '10 seconds', date_time) AS window_start FROM auctions)
SELECT p.id, p.name, p.window_start
FROM p JOIN a ON p.id = a.seller AND p.window_start = a.window_start, wm
WHERE p.window_start + INTERVAL '10 seconds' <= wm.w
