"""Drop-in sessions for agent frameworks, each behind its own extra (docs/integrations.md).

- gridmem.integrations.openai_agents: `GridmemSession`, an OpenAI Agents SDK
  `agents.memory.Session` (extra `gridmem[openai-agents]`);
- gridmem.integrations.langchain: `GridmemChatMessageHistory`, a LangChain
  `BaseChatMessageHistory` (extra `gridmem[langchain]`);
- gridmem.integrations.llama_index: `GridmemChatStore`, a LlamaIndex `BaseChatStore`
  (extra `gridmem[llama-index]`).

Nothing is imported here: `import gridmem` (and this package) needs no framework;
import the one module you use. The mapping all three share is in `mapping.py`.
"""
