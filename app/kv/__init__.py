"""The KV-cache pages: the live cache of a run, users per GPU, attention designs, paging (sections,
figures), and the cache on and off (on_off).
"""
