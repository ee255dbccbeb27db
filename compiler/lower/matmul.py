"""Matrix products on the MAU: placeholder until the matmul kernel lands."""
