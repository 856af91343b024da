"""Built-in environment families. Each subpackage is imported only when its env is made."""
