"""Common given names, for the name pattern of :mod:`gateway.deidentify`.

A pattern, not a model: person names are found by Presidio only with an NER model (a spaCy or transformers
download), which this machine cannot fetch. Names that are also ordinary capitalised English words (Will,
May, Mark, Rose, Grace, Max, Jordan, Paris, ...) are left out, so a sentence that starts with one of those
words is not mangled; such names are still caught after an honorific or a self-introduction.
"""

from __future__ import annotations

FIRST_NAMES = frozenset(
    """
    Aaron Abdul Abigail Adam Adrian Ahmed Aidan Aisha Alan Albert Alejandro Alex Alexander Alexandra Alexis
    Alfred Ali Alice Alicia Alison Allison Amanda Amelia Amir Amy Ana Andrea Andrew Andy Angela Anita Ann Anna
    Anne Annie Anthony Antonio Arjun Arthur Ashley Barbara Beatrice Ben Benjamin Bernard Beth Betty Beverly
    Bob Bobby Brandon Brenda Brian Bruce Bryan Caleb Cameron Carl Carla Carlos Carmen Carol Caroline Carolyn
    Catherine Charles Charlie Charlotte Chen Cheryl Chloe Chris Christina Christine Christopher Claire Clara
    Claudia Colin Connor Craig Cynthia Daniel Daniela Danielle Darren David Deborah Debra Denise Dennis Diana
    Diane Diego Dmitri Donald Donna Dorothy Douglas Dylan Edward Elena Eleanor Elijah Elizabeth Ella Ellen
    Emily Emma Eric Erica Erik Ethan Eugene Evelyn Fatima Felix Fernando Fiona Francesca Francisco Gabriel
    Gabriela Gary George Gerald Giovanni Gloria Gregory Hannah Hans Harold Harry Heather Helen Henry Hiroshi
    Hugo Ian Igor Irene Isaac Isabel Isabella Ivan Jack Jacob James Jamie Jane Janet Janice Jason Javier
    Jeffrey Jennifer Jeremy Jessica Jim Joan Joanna Joe Joel John Jonathan Jorge Jose Joseph Joshua Joyce
    Juan Judith Julia Julie Justin Karen Katherine Kathleen Kathryn Katie Keith Kelly Kenneth Kevin Kimberly
    Kyle Larry Laura Lauren Leah Leo Liam Linda Lisa Logan Louis Lucas Lucy Luis Luke Madison Maria Marco
    Margaret Maria Marie Marilyn Mario Marta Martha Martin Mary Matthew Megan Melissa Michael Michelle Miguel
    Mohammed Muhammad Nancy Natalie Nathan Nicholas Nicole Noah Olga Oliver Olivia Oscar Pablo Pamela Patricia
    Patrick Paul Paula Peter Philip Priya Rachel Rafael Rahul Ralph Raymond Rebecca Richard Robert Roberto
    Roger Ronald Ruth Ryan Samantha Samuel Sandra Sara Sarah Scott Sean Sebastian Sergei Sharon Shirley Simon
    Sofia Sophia Sophie Stephanie Stephen Steven Susan Teresa Theresa Thomas Timothy Tom Tyler Valentina
    Valerie Vanessa Victoria Vincent Virginie Walter Wei William Xavier Yuki Yusuf Zachary Zoe
    """.split()
)
