SELECT auction, bidder, price, channel, url, date_time, extra FROM bids
