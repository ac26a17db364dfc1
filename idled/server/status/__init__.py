"""What a running core shows beyond the scrape-time gauges: ``GET /status``'s summary (``overview``), the last
minutes and lateness (``vitals``), and an edge's watermark lag (``lagwatch``).
"""
