SELECT p.name, p.city, p.state, a.id FROM auctions a JOIN persons p ON a.seller = p.id WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')
