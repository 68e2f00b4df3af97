"""gridmem's multiprocess worker service: `gridmem serve`, `gridmem demo`, the LLM client.

Agents import the library, `gridmem`; this package runs it as a service. It
imports the library; the library never imports it.
"""
