"""Strict accounting: every admission recorded in its quota tree's ledger ConfigMap before it is
answered. docs/design.md, "Strict accounting", draws the shape and says which module holds what.
"""
