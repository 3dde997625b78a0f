"""The red team of issue 43 (exact accounting, the one gate, per-buyer shares): each test is
an attack that passes while the market holds."""
