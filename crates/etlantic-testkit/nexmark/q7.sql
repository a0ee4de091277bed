WITH wm AS (SELECT date_trunc('millisecond', max(date_time)) - INTERVAL '2 seconds' AS w FROM bids),
b AS (SELECT auction, price, bidder, date_time, date_bin(INTERVAL '10 seconds', date_time) AS window_start FROM bids),
m AS (SELECT window_start, max(price) AS max_price FROM b GROUP BY window_start)
SELECT b.auction, b.price, b.bidder, b.date_time
FROM b JOIN m ON b.window_start = m.window_start AND b.price = m.max_price, wm
WHERE m.window_start + INTERVAL '10 seconds' <= wm.w
