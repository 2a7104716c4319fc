def build_1_2_5_buckets(max_value: int) -> list:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's edges for token counts)."""
    edges, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return edges
            edges.append(mantissa * scale)
        scale *= 10
