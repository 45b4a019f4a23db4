"""Renderings for people: the verdict as text and the self-contained HTML incident page.
"""
