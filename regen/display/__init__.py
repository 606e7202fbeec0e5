"""How a run shows itself to people: numbers, tables, pictures, names, a verdict's words."""
