"""Health checks (profiles, XID overrides, hardware paths)."""
