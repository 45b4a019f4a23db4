"""One incident end to end: deliver its trace (collector or embedded file) and write the files beside the dumps.
"""
