// Anchor source for the fsdp_pch object library; the PCH is its only product.
