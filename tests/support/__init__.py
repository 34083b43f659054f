"""Helpers every suite shares: waiting on a condition, the markers a test's needs ask for."""
