"""What the audit view and ``reaper evaluate --format html`` show people: reasons in words, one row per
resource, inline SVG charts and the page around them. Plain functions over plain data, no I/O, so the
plugin's pages and the offline report render the same way."""
