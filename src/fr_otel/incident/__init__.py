"""One incident end to end: what raised it (the trigger), its verdict and trace, the trace's delivery (collector or
embedded file), the verdict in short, and the files beside the dumps.
"""
