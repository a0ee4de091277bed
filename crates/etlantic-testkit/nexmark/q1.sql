SELECT auction, bidder, price * 89 / 100 AS price, date_time FROM bids
