"""The synthetic task and the answer format: left-to-right arithmetic (`arithmetic`), told as a word problem
(`word_problems`), the problem sets a run trains and evaluates on (`synthetic`), chain word problems whose answers need
every step (`chain_problems`, with their splits and sets in `chains`), and `\\boxed{}` answers (`boxed`).
Standard library only: no torch."""
