WITH wm AS (SELECT date_trunc('millisecond', max(date_time)) - INTERVAL '2 seconds' AS w FROM bids),
assigned AS (
  SELECT auction, date_bin(INTERVAL '5 seconds', date_time) AS window_start FROM bids
  UNION ALL
  SELECT auction, date_bin(INTERVAL '5 seconds', date_time) - INTERVAL '5 seconds' AS window_start FROM bids
),
counts AS (
  SELECT auction, window_start, window_start + INTERVAL '10 seconds' AS window_end, count(*) AS num
  FROM assigned GROUP BY auction, window_start
),
closed AS (SELECT counts.* FROM counts, wm WHERE counts.window_end <= wm.w),
maxes AS (SELECT window_start, max(num) AS max_num FROM closed GROUP BY window_start)
SELECT c.auction, c.num, c.window_start, c.window_end
FROM closed c JOIN maxes m ON c.window_start = m.window_start AND c.num = m.max_num
