"""The node agent: reads the hardware's own evidence and reports it (COL-*).

One module per signal; each returns exactly one of ok / unavailable (why) / failed (error).
"""
