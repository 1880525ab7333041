"""Run primitives every long job shares: stopping on a signal (`stop`) and reading its sources
(`sources`: image folders, video frames and their count, one rule for an unreadable frame)."""
