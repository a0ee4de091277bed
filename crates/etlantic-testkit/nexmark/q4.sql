WITH wm AS (
  SELECT least(
    (SELECT date_trunc('millisecond', max(date_time)) FROM bids),
    (SELECT date_trunc('millisecond', max(date_time)) FROM auctions)
  ) - INTERVAL '2 seconds' AS w
),
winning AS (
  SELECT a.category, max(b.price) AS final
  FROM auctions a JOIN bids b ON b.auction = a.id, wm
  WHERE b.date_time BETWEEN a.date_time AND a.expires
    AND a.date_time + INTERVAL '10 seconds' <= wm.w
  GROUP BY a.id, a.category, a.date_time
)
SELECT category, avg(final) AS avg_final FROM winning GROUP BY category
