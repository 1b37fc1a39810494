"""Teams on the control plane: workspaces (a team's share of projects, chips and dollars, and its
members' roles), the actor a request is made by, and what each may see and do."""
