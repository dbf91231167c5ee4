"""Log lines: formatting that a client cannot forge or flood, and redaction of credentials."""
