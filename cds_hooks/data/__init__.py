"""Knowledge shipped as data: drug vocabulary, interaction table, panic values, NEWS2."""
