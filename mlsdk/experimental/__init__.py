"""MLSDK's experimental helpers (`mlsdk.experimental.llm`), as PFN's LLM examples import them."""
