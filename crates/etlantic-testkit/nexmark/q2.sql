SELECT auction, price FROM bids WHERE auction % 123 = 0
