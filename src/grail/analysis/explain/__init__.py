"""`grail explain`: where each method puts the credit, token by token: computing (`compute`), the HTML page
(`html`) and the command line (`cli`)."""
