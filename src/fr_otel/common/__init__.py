"""Small shared helpers every layer uses: printable text, rank lists, safe output files, progress.
"""
