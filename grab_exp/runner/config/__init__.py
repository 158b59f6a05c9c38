"""What a job's config may say: the typed schema, the checks of its values, and its fingerprint."""
